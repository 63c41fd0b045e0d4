"""THE measurement loop (run), the session it runs in (the runner and models a run opens), its phases and the
run's interrupt handling, and the passes that run along the outputs (target identity).
"""
