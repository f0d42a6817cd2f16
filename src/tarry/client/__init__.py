"""(package docstring to be written with its first module)"""
