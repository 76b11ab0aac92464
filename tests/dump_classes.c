/* tests/dump_classes.c: writes bpe_char_class() of every code point
 * 0..0x10FFFF to stdout, one byte each, for the tiktoken differential test. */
#include "tokenizer.h"

#include <stdio.h>

int main(void)
{
    static unsigned char cls[0x110000];
    for (uint32_t cp = 0; cp < 0x110000; cp++) cls[cp] = (unsigned char)bpe_char_class(cp);
    return fwrite(cls, 1, sizeof cls, stdout) == sizeof cls && fflush(stdout) == 0 ? 0 : 1;
}
