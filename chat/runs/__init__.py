"""Runs: the parts of the engine that own a run's state.

``state``: a run's row and its transitions (claim, fence, release, finish,
heartbeat, what a sweep may resume), with its state diagram. ``local``:
what this process is stepping now (one table, one lock). ``commands``: launch,
retry, regenerate, edit, wake and stop. ``driver``: claim, step, release
(``Start``: how a step begins). ``upkeep``: heartbeat, sweep, wind-down.
A step's events become fragments in ``chat.publisher``.
"""
