"""Offline code of the request classifier: the labelled corpus, training and evaluation.

The daemon never imports this package: it scores with ``controller.classifier``, loading the
artifact that ``training.classifier.training`` writes (docs/classifier.md). The heavy
dependencies (scipy, scikit-learn, the data packages) are imported only from here.
"""
