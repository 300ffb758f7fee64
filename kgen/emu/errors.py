"""How the emulator says no. Both errors name the construct; the launcher adds the kernel source
line and the program (block index) where it happened."""

from __future__ import annotations


class EmuError(Exception):
    """The emulator could not run the kernel to the end."""


class EmuUnsupported(EmuError):
    """A construct outside the FlyDSL subset the emulator models: it refuses rather than guess."""


class EmuFault(EmuError):
    """The kernel did something whose result the hardware leaves undefined, or a bug a GPU would
    hide: an access outside a tensor or LDS array, an LDS race, lanes storing different values
    to one address, two programs of a launch depending on each other's memory."""
