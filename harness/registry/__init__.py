"""The data layer every stage reads (bottom of the import order): paths, the torchtitan
generations, the known issues, the tolerances, the expectations lookup, the HF config reader,
the assets and run-folder layouts, the environment variables, the check kinds. Imports nothing
above it.
"""
