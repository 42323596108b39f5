#pragma once
#include "xenprobes/hypervisor.hpp"  // public: the hypervisor seam is part of the API
