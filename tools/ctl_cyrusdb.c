/* placeholder: being written */
#include <stdio.h>
int main(void) { fputs("not written yet\n", stderr); return 1; }
