#pragma once
#include "xenprobes/types.hpp"  // public: the strong types are part of the API
