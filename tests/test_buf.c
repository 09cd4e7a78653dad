/* mu_buf (src/util/common.h): appends, printf of any length (into the spare
 * room, and grown when it does not fit), the size limit, take/str/free. */
#include "testutil.h"
#include "util/common.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_append(void) {
    mu_buf b = {0};
    CHECK(strcmp(mu_buf_str(&b), "") == 0);
    CHECK(b.p && b.len == 0);
    mu_buf_puts(&b, "ab");
    mu_buf_putc(&b, 'c');
    mu_buf_append(&b, "defg", 2);
    CHECK_EQ_INT(b.len, 5);
    CHECK(strcmp(b.p, "abcde") == 0);
    mu_buf_free(&b);
    CHECK(!b.p && b.len == 0 && b.cap == 0);
    char *s = mu_buf_take(&b); /* never NULL, even unused */
    CHECK(s && strcmp(s, "") == 0);
    free(s);
}

static void test_appendf(void) {
    mu_buf b = {0};
    mu_buf_appendf(&b, "%s", ""); /* like mu_buf_append(b, "", 0): a C string */
    CHECK(b.p && b.len == 0 && b.p[0] == 0);
    mu_buf_appendf(&b, "%d-%s", 42, "x"); /* fits the spare room */
    CHECK(strcmp(b.p, "42-x") == 0);
    /* longer than the room, than the first 64 bytes and than 1 KiB */
    char big[5000], want[6000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = 0;
    mu_buf_appendf(&b, "[%s]%d", big, 7);
    snprintf(want, sizeof want, "42-x[%s]7", big);
    CHECK_EQ_INT(b.len, strlen(want));
    CHECK(strcmp(b.p, want) == 0);
    for (int i = 0; i < 1000; i++) mu_buf_appendf(&b, "%03d", i % 1000);
    CHECK_EQ_INT(b.len, strlen(want) + 3000);
    CHECK(memcmp(b.p + strlen(want), "000001002", 9) == 0);
    CHECK(strcmp(b.p + b.len - 3, "999") == 0);
    char *s = mu_buf_take(&b);
    CHECK(!b.p && b.len == 0 && b.cap == 0);
    free(s);
}

static void test_limit(void) {
    mu_buf b = {.limit = 8};
    mu_buf_puts(&b, "1234");
    mu_buf_appendf(&b, "%s", "5678"); /* exactly the limit */
    CHECK(!b.over && strcmp(b.p, "12345678") == 0);
    mu_buf_appendf(&b, "%d", 9); /* over: dropped, the text stays */
    CHECK(b.over && b.len == 8 && strcmp(b.p, "12345678") == 0);
    mu_buf_free(&b);

    mu_buf c = {.limit = 8};
    mu_buf_appendf(&c, "%s", "abc"); /* leaves spare room the next one writes into */
    mu_buf_appendf(&c, "%s", "defghi");
    CHECK(c.over && c.len == 3 && strcmp(c.p, "abc") == 0);
    mu_buf_putc(&c, 'x'); /* once over, every append is dropped */
    CHECK(c.len == 3);
    mu_buf_free(&c);
    CHECK(c.over && c.limit == 8);

    mu_buf d = {.limit = 4};
    mu_buf_append(&d, "hello", 5);
    CHECK(d.over && !d.p);
    CHECK(strcmp(mu_buf_str(&d), "") == 0);
}

int main(void) {
    test_append();
    test_appendf();
    test_limit();
    TEST_MAIN_END();
}
