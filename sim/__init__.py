"""Discrete-event simulation of a continuous-batching DFlash server (``draftctl simulate``)."""
