"""The CRDs as Python data: the schema fragments, the generated ``crds/*.yaml`` and their verification."""
