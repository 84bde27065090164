"""Helpers shared by forkless's Triton kernels (attention, fused layer ops, the GEMV).

Nothing is imported here: each module imports Triton, and only code that launches Triton
kernels imports them.
"""
