"""Session 10: what turns2.sh ran — ab_env.py with VAR = SPATTN_BAND_TURNS (the experiment build's switch between
the band kernel without and with consumer turns). turns2.txt was printed by this script's first version, which
was ab_env.py with that name built in (its lines read 'turns0 ... turns1' where ab_env.py prints 'VAR=0 ... =1').
Usage: python3 ab_turns.py LIB [rounds]"""
import os
import runpy
import sys

sys.argv = [sys.argv[0], sys.argv[1], "SPATTN_BAND_TURNS"] + sys.argv[2:]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ab_env.py"), run_name="__main__")
