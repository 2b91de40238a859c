// optimizer.cpp: non-finite skip, loss scaling, clipping and AdamW.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace mgrl::train {

Optimizer::Optimizer(kernels::Ops& ops, const Trainable& tr, OptimizerOptions opts)
    : ops_(ops), tr_(tr), opts_(std::move(opts)) {
  m_ = static_cast<float*>(ops_.alloc(tr_.n * sizeof(float)));
  v_ = static_cast<float*>(ops_.alloc(tr_.n * sizeof(float)));
}

Optimizer::~Optimizer() {
  ops_.release(m_);
  ops_.release(v_);
}

double Optimizer::loss_scale(const TrainState& st) const { return ops_.storage() == DType::F16 ? st.loss_scale : 1.0; }

bool Optimizer::step(TrainState& st, double norm, double loss) {
  const bool scaling = ops_.storage() == DType::F16;
  const double scale = loss_scale(st);
  if (!std::isfinite(norm) || !std::isfinite(loss)) {
    ++st.skipped_steps;
    ++st.step;
    if (scaling) {
      st.loss_scale = std::max(1.0, st.loss_scale / 2);
      st.scaler_good_steps = 0;
    }
    return false;
  }
  if (scaling && ++st.scaler_good_steps >= 1000) {  // grow again after 1000 good steps
    st.loss_scale = std::min(65536.0 * 256, st.loss_scale * 2);
    st.scaler_good_steps = 0;
  }
  kernels::Ops::AdamW hp = opts_.adamw;
  hp.lr = static_cast<float>(opts_.schedule.at(st.step));
  hp.step = st.step + 1 - st.skipped_steps;
  const double clip = opts_.max_grad_norm > 0 && norm > opts_.max_grad_norm ? opts_.max_grad_norm / norm : 1.0;
  hp.grad_scale = static_cast<float>(clip / scale);
  ops_.adamw(tr_.params, tr_.grads, m_, v_, tr_.n, hp);
  tr_.params_changed();
  ++st.step;
  return true;
}

}  // namespace mgrl::train
