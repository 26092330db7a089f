/* placeholder */
#include "config.h"
#include "cyrusdb/skiplist.h"
extern int skiplist_placeholder;
int skiplist_placeholder;
