// Translation unit that builds the shared precompiled header (see framework/CMakeLists.txt).
#include "pch/pch.h"
