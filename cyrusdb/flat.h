/* placeholder */
#ifndef CYRUSDB_FLAT_H
#define CYRUSDB_FLAT_H
#endif
