"""The model registry: versions, the champion, and what decides a promotion."""
