"""Runs: the parts of the engine that own a run's state.

``local``: what this process is stepping now (one table, one lock). The
rest of the engine (the commands, the driver, the upkeep) is
``chat.engine``; a run's row and its transitions are ``chat.services``'
claim, fence, release and finish.
"""
