"""What keeps a rank from outliving its job: the stall watchdog (with the job's pulse, which
tells it of progress on other ranks) and the launcher lifeline."""
