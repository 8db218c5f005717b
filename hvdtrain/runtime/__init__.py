"""What keeps a rank from outliving its job: the stall watchdog and the launcher lifeline."""
