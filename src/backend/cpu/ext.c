/* cpu backend: overrides for the ext op family (see backend/kernels_ext.h). */
#include "backend/kernels.h"

void tg__cpu_ext_register(void)
{
}
