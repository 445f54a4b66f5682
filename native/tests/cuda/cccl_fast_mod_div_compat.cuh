// cccl_fast_mod_div_compat.cuh - cuda::fast_mod_div<uint32_t> for toolkits whose CCCL predates it.
//
// FlashInfer 0.7.4's fastdiv.cuh (the page-size divisor of its paged KV kernels) wraps
// cuda::fast_mod_div from <cuda/cmath>, which CCCL added in 3.1.0 (CUDA 13.1). CUDA 13.0 ships CCCL
// 3.0.1, so with nvcc 13.0 (the GPU machine's) FlashInfer's headers do not compile. Included before
// FlashInfer's headers, this file defines cuda::fast_mod_div (the members fastdiv.cuh uses: an
// explicit constructor from the divisor, uint32 / and %, conversion back to the divisor) when the
// toolkit's CCCL is older than 3.1, and nothing otherwise. Written here, not taken from CCCL: the
// round-up method of division by an invariant integer (Granlund & Montgomery 1994; Hacker's Delight
// 10-9): l = ceil(log2 d), m = floor(2^32 (2^l - d) / d) + 1, n / d = (mulhi(m, n) + n) >> l with the
// sum in 64 bits, exact for every 32-bit n and d >= 1. CF_FAST_MOD_DIV_COMPAT is 1 when it is in use.
#pragma once

#include <cuda/std/cstdint>  // CCCL_VERSION (cuda/std/__cccl/version.h)
#include <cuda/std/type_traits>

#if !defined(CCCL_VERSION) || CCCL_VERSION < 3001000
#define CF_FAST_MOD_DIV_COMPAT 1

namespace cuda {

template <typename T, bool DivisorIsNeverOne = false>
class fast_mod_div {
    static_assert(::cuda::std::is_same<T, ::cuda::std::uint32_t>::value || ::cuda::std::is_same<T, unsigned int>::value,
                  "this compatibility fast_mod_div covers 32-bit unsigned divisors only (FlashInfer's uint_fastdiv)");

  public:
    fast_mod_div() = delete;

    __host__ __device__ explicit fast_mod_div(T divisor) noexcept : divisor_(divisor) {
        unsigned l = 0;
        while (l < 32 && (((::cuda::std::uint64_t) 1) << l) < (::cuda::std::uint64_t) divisor) {
            ++l;
        }
        const ::cuda::std::uint64_t two32 = ((::cuda::std::uint64_t) 1) << 32;
        multiplier_ = (::cuda::std::uint32_t) ((two32 * ((((::cuda::std::uint64_t) 1) << l) - divisor)) / divisor + 1);
        shift_ = l;
    }

    __host__ __device__ operator T() const noexcept { return divisor_; }

    friend __host__ __device__ T operator/(T n, fast_mod_div d) noexcept { return d.quotient(n); }
    friend __host__ __device__ T operator%(T n, fast_mod_div d) noexcept { return n - d.quotient(n) * d.divisor_; }

  private:
    __host__ __device__ T quotient(T n) const noexcept {
#ifdef __CUDA_ARCH__
        const ::cuda::std::uint32_t hi = __umulhi(multiplier_, n);
#else
        const ::cuda::std::uint32_t hi = (::cuda::std::uint32_t) (((::cuda::std::uint64_t) multiplier_ * n) >> 32);
#endif
        return (T) ((((::cuda::std::uint64_t) hi) + n) >> shift_);
    }

    T divisor_;
    ::cuda::std::uint32_t multiplier_;
    unsigned shift_;
};

}  // namespace cuda

#else
#define CF_FAST_MOD_DIV_COMPAT 0
#endif
