"""vapo: Value-based Augmented PPO (arXiv 2504.05118). The trainer is being written (issue 5)."""
import sys

if __name__ == "__main__":
    print("vapo: the end-to-end trainer has not landed yet; gae.py and losses.py hold the VAPO math.")
    sys.exit(0)
