// kiln stand-in (see ../context.h).
#pragma once
#include <gloo/context.h>
