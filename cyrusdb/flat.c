/* placeholder */
#include "config.h"
#include "cyrusdb/flat.h"
extern int flat_placeholder;
int flat_placeholder;
