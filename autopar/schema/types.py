"""Strict scalar types for boundary models: a bool is not a number, a float is not a whole
number, a string is neither, and numbers are finite. (Pydantic's lax mode reads `true` as 1 and
4096.0 as 4096; these refuse both.)"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict

Count = Annotated[int, Strict()]  # a whole number; not a bool, float or string
Real = Annotated[float, Strict(), Field(allow_inf_nan=False)]  # a finite number (ints allowed); not a bool
Flag = Annotated[bool, Strict()]  # true or false; not 0/1 or "yes"
