// Precompiled header: LibTorch and the standard headers most translation units use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>
