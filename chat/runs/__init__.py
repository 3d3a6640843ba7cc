"""Runs: the parts of the engine that own a run's state.

``state``: a run's row and its transitions (claim, fence, release, finish,
heartbeat, what a sweep may resume), with its state diagram. ``local``:
what this process is stepping now (one table, one lock). The commands, the
driver (``Start``: how a step begins) and the upkeep are ``chat.engine``.
"""
