//! kiln's configuration: built-in defaults, the matched hardware profile, the user's file,
//! environment and command line, layered with figment into raw values and then validated into a
//! typed run plan in which every value knows the layer that set it.
//!
//! Layering: knows `kiln-device` and `kiln-profiles`, nothing above them. The layers, the typed
//! plan and provenance arrive with the hardware-aware configuration work (issue 3).
