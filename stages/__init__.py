"""One module per DVC stage; run each as `python -m stages.<name>` from the repository root."""
