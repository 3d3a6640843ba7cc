"""The approvals app's services, one home per concern.

``rules``: what the rules say about a call, and members' own Allow rules.
``decisions``: a person's decision, first one wins, and the cards it redraws.
``waiting``: a call asked for, waited on, ended, and its output kept.
"""
