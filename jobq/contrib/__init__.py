"""Framework integrations: ``jobq.contrib.django`` and ``jobq.contrib.flask``.

Each imports its framework; ``import jobq`` imports neither.
"""
