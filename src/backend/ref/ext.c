/* ref backend: kernels of the ext op family (see backend/kernels_ext.h). */
#include "backend/kernels.h"

void tg__ref_ext_register(void)
{
}
