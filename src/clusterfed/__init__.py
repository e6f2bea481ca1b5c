"""clusterfed: clustered and continual federated learning.

The library is importable without DVC, Prefect or MLflow: ``data`` and ``scenarios``
build a federation, ``engine`` trains and evaluates many models at once, and
``algorithms`` cluster devices on top of the engine.
"""

__version__ = "0.1.0"
