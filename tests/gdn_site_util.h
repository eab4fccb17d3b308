// The scratch of a Backend::GdnSite carved from one buffer, in the one layout the site tests use:
// conv [t][channels]; alpha, beta_in, g, beta [t][n_v]; o, normed_o, out [t][n_v·d_v].
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace bonsai::testing_util {

inline int64_t gdn_channels(const GdnShape& s) {
  return 2 * static_cast<int64_t>(s.n_k) * s.d_k + static_cast<int64_t>(s.n_v) * s.d_v;
}

// Floats of the scratch for t tokens.
inline int64_t gdn_scratch_floats(const GdnShape& s, int t) {
  return t * (gdn_channels(s) + 4 * static_cast<int64_t>(s.n_v) + 3 * static_cast<int64_t>(s.n_v) * s.d_v);
}

// Points the site's scratch fields (conv .. out) into base, which holds gdn_scratch_floats(s, t).
inline void bind_gdn_scratch(Backend::GdnSite& site, float* base, const GdnShape& s, int t) {
  const int64_t nv = static_cast<int64_t>(t) * s.n_v, dv = nv * s.d_v;
  site.conv = base;
  site.alpha = base + t * gdn_channels(s);
  site.beta_in = site.alpha + nv;
  site.g = site.beta_in + nv;
  site.beta = site.g + nv;
  site.o = site.beta + nv;
  site.normed_o = site.o + dv;
  site.out = site.normed_o + dv;
}

}  // namespace bonsai::testing_util
