/* placeholder */
#include "config.h"
#include "lib/imapconf.h"
