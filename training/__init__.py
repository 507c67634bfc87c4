"""Training recipe for draftctl's own target + DFlash draft pairs (see docs/model-card.md)."""
