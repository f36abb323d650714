// kiln stand-in (see ../context.h).
#pragma once
#include <chrono>
#include <exception>
