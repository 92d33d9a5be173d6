"""Unit constants, named once. GiB for memory (1024**3), GB for bandwidth (1e9), as vendors do."""

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12

GFLOPS = 1e9
TFLOPS = 1e12
PFLOPS = 1e15

US = 1e-6  # one microsecond in seconds
MS = 1e-3  # one millisecond in seconds

GBIT = 1e9 / 8  # one gigabit in bytes
