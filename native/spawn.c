/* Helpers the controller calls in a replica between fork and exec. */
#include <sys/personality.h>

/* Same address layout in every replica (as setarch -R and rr do): programs
 * that let pointer values steer behaviour then behave alike.  OrderInfo
 * never relies on it. */
int llft_disable_aslr(void)
{
    int cur = personality(0xffffffff);
    return cur < 0 ? cur : personality((unsigned long)cur | ADDR_NO_RANDOMIZE);
}
