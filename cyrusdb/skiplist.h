/* placeholder */
#ifndef CYRUSDB_SKIPLIST_H
#define CYRUSDB_SKIPLIST_H
#endif
