"""Registry API: thin viewsets over the registry services and selectors, one module per resource (models,
datasets, rewards, environments; common.py holds what they share)."""
