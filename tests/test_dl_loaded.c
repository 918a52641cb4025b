/* src/base/dl_loaded.c: "is this library loaded?" never loads it, answers
 * absent while it is absent (also from the kept answer), and sees a library
 * the program loads later, as a program that imports a CUDA framework after
 * its first collective does. libresolv stands in for the CUDA driver: it
 * ships with libc and nothing in this test loads it. */
#include <check.h>
#include <dlfcn.h>
#include <stdlib.h>

#include "dl_loaded.h"

#define LATE_LIB "libresolv.so.2"

static int loaded_now(const char *soname)
{
    void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        dlclose(h); /* drop the reference NOLOAD took */
    return h != NULL;
}

START_TEST(loaded_library_found)
{
    static braid_dl_probe probe;
    ck_assert_ptr_nonnull(braid__dl_if_loaded("libc.so.6", &probe));
    ck_assert_ptr_nonnull(braid__dl_if_loaded("libc.so.6", &probe));
}
END_TEST

START_TEST(absent_then_loaded_later)
{
    static braid_dl_probe probe;
    ck_assert_msg(!loaded_now(LATE_LIB), LATE_LIB " is already loaded; the test needs a library that is not");
    for (int i = 0; i < 3; i++) /* the first asks dlopen, the others the kept answer */
        ck_assert_ptr_null(braid__dl_if_loaded(LATE_LIB, &probe));
    ck_assert_msg(!loaded_now(LATE_LIB), "asking loaded " LATE_LIB);
    ck_assert_ptr_null(braid__dl_if_loaded("libbraid-no-such-library.so.9", &probe));

    void *late = dlopen(LATE_LIB, RTLD_NOW);
    ck_assert_msg(late != NULL, "cannot load %s: %s", LATE_LIB, dlerror());
    ck_assert_msg(braid__dl_if_loaded(LATE_LIB, &probe) != NULL, "a library loaded after an absent answer was not seen");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dl_loaded");
    TCase *tc = tcase_create("dl_loaded");
    tcase_add_test(tc, loaded_library_found);
    tcase_add_test(tc, absent_then_loaded_later);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
