/* placeholder: this test program is being written; 77 = skipped */
int main(void) { return 77; }
