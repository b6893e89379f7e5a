"""RL objectives behind one protocol (fastvideo.algorithms.base.Objective).

An algorithm is one module here: its advantages from rewards, the loss of one unit of stored
work, and any state of its own. The trainer's update loop (micro-batches, accumulation, clipping,
optimizer steps, skipping non-finite steps) is shared and names no algorithm.
"""
