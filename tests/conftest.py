import os
import sys

# Test helper modules (helpers.py, dist/jobs.py) are imported by name.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
