"""rewrite-safety: why `graphify rewrite` leaves a loop alone when capture would change its training.

GFY701-706 are the rewrite planner's refusals (graphify/plan/: dataflow.py, whole.py, inputs.py,
mutations.py, partial.py raise them, graphify/plan/refusals.py names them): the engine reports every
per-step host value, host side effect and mutated state (GFY701-703) the planner finds, and the reason
that decides a loop's verdict. The detections here report some of GFY701-703 by pattern too. GFY707 is a
pattern: the step handed to code the analysis cannot see. One module per rule; shared.py holds what they
share.
"""
