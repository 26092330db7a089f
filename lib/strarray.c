/* placeholder */
#include "config.h"
#include "lib/strarray.h"
