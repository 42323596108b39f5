#pragma once
#include "xenprobes/sim.hpp"  // public: users test against the simulated Xen too
