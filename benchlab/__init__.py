"""The lab's shared code: params, data, the measurement harness, reports."""
