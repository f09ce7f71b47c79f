/* ref backend: kernels of the nn op family (see backend/kernels_nn.h). */
#include "backend/kernels.h"

void tg__ref_nn_register(void)
{
}
