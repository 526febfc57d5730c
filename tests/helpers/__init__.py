"""What several test modules share: fixtures' machinery and the assertions of one claim each.

Test modules import from here (and from the tiny-model builders under tests/models/), never
from one another.
"""
