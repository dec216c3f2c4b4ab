"""The register step: a trained, evaluated run recorded as a registry version (its files, its
decision, its fingerprint), and uploaded to the Vertex AI Model Registry when asked. A step of its
own above the registry package (components/model_registry/: versions, the champion, the promotion rule),
which the evaluate step also reads."""
