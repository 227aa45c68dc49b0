//! Model parameters as one flat `Vec<f32>`, in the module's field order (the same on every node).
//!
//! Reading uses a [`ModuleVisitor`], writing a [`ModuleMapper`] that keeps every parameter id, so
//! optimizer state keyed by those ids survives a load. The round trip is exact.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Standard deviation of the genesis init for weight matrices and embeddings (GPT-2's 0.02).
pub const INIT_STD: f64 = 0.02;

struct Reader {
    out: Vec<f32>,
}

impl<B: Backend> ModuleVisitor<B> for Reader {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let data = param.val().into_data();
        match data.as_slice::<f32>() {
            Ok(s) => self.out.extend_from_slice(s),
            // Non-f32 element types (e.g. half precision on a GPU) convert first.
            Err(_) => self.out.extend(data.convert::<f32>().iter::<f32>()),
        }
    }
}

struct Writer<'a, B: Backend> {
    values: &'a [f32],
    offset: usize,
    device: B::Device,
}

impl<B: Backend> ModuleMapper<B> for Writer<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, old, mapper) = param.consume();
        let dims = old.dims();
        let n: usize = dims.iter().product();
        let end = (self.offset + n).min(self.values.len());
        let slice = &self.values[self.offset..end];
        self.offset += n;
        let tensor = if slice.len() == n {
            Tensor::<B, D>::from_data(TensorData::new(slice.to_vec(), dims), &self.device)
        } else {
            old.clone()
        };
        let tensor = if old.is_require_grad() {
            tensor.require_grad()
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Number of float parameters of `module`.
pub fn num_params<B: Backend, M: Module<B>>(module: &M) -> usize {
    module.num_params()
}

/// Reads every float parameter of `module`, in field order.
pub fn flatten<B: Backend, M: Module<B>>(module: &M) -> Vec<f32> {
    let mut r = Reader {
        out: Vec::with_capacity(module.num_params()),
    };
    module.visit(&mut r);
    r.out
}

/// Error of [`unflatten`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("parameter vector has {got} values, the model has {expected}")]
pub struct LengthMismatch {
    pub got: usize,
    pub expected: usize,
}

/// Writes `values` into `module`'s float parameters, keeping parameter ids.
///
/// # Errors
/// When `values` does not have exactly as many values as the module has parameters (the module
/// is dropped then: check [`Module::num_params`] first to keep it).
pub fn unflatten<B: Backend, M: Module<B>>(
    module: M,
    values: &[f32],
    device: &B::Device,
) -> Result<M, LengthMismatch> {
    let expected = module.num_params();
    if values.len() != expected {
        return Err(LengthMismatch {
            got: values.len(),
            expected,
        });
    }
    let mut w = Writer::<B> {
        values,
        offset: 0,
        device: device.clone(),
    };
    Ok(module.map(&mut w))
}

struct Namer {
    path: Vec<String>,
    leaves: Vec<(String, usize)>,
}

impl<B: Backend> ModuleVisitor<B> for Namer {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let n = param.val().dims().iter().product();
        self.leaves.push((self.path.join("."), n));
    }
}

struct Shaper {
    shapes: Vec<Vec<usize>>,
}

impl<B: Backend> ModuleVisitor<B> for Shaper {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.shapes.push(param.val().dims().to_vec());
    }
}

/// The shape of every float parameter, in field order (the flat vector's segments).
pub fn param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<Vec<usize>> {
    let mut s = Shaper { shapes: vec![] };
    module.visit(&mut s);
    s.shapes
}

/// Dotted names and sizes of every float parameter, in field order.
pub fn param_names<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, usize)> {
    let mut n = Namer {
        path: vec![],
        leaves: vec![],
    };
    module.visit(&mut n);
    n.leaves
}

/// The swarm's genesis parameters θ(0): a function of the architecture and `seed` only, identical
/// on every backend. Norm scales start at 1, norm shifts and biases at 0, every other weight is
/// drawn from N(0, [`INIT_STD`]²) by a seeded ChaCha8 stream.
pub fn genesis_params<B: Backend, M: Module<B>>(module: &M, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(module.num_params());
    for (name, n) in param_names::<B, M>(module) {
        let leaf = name.rsplit('.').next().unwrap_or("");
        match leaf {
            "gamma" => out.extend(std::iter::repeat_n(1.0f32, n)),
            "beta" | "bias" => out.extend(std::iter::repeat_n(0.0f32, n)),
            _ => out.extend((0..n).map(|_| (normal(&mut rng) * INIT_STD) as f32)),
        }
    }
    out
}

/// One standard normal sample (Box–Muller), so the stream does not depend on rand_distr.
fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GptConfig;
    use crate::backend::{Cpu, cpu_device};

    #[test]
    fn flatten_then_unflatten_is_exact() {
        let dev = cpu_device();
        let cfg = GptConfig::preset("tiny", 10).unwrap();
        let m = cfg.init::<Cpu>(&dev);
        let v: Vec<f32> = (0..m.num_params()).map(|i| (i as f32).sin()).collect();
        let m = unflatten(m, &v, &dev).unwrap();
        assert_eq!(flatten(&m), v);
        assert!(unflatten(m, &v[1..], &dev).is_err());
    }

    #[test]
    fn genesis_is_deterministic_and_names_norms_and_biases() {
        let dev = cpu_device();
        let cfg = GptConfig::preset("tiny", 10).unwrap();
        let m = cfg.init::<Cpu>(&dev);
        let names = param_names::<Cpu, _>(&m);
        assert!(names.iter().any(|(n, _)| n.ends_with("gamma")), "{names:?}");
        assert!(names.iter().any(|(n, _)| n.ends_with("bias")), "{names:?}");
        let a = genesis_params::<Cpu, _>(&m, 1);
        let b = genesis_params::<Cpu, _>(&cfg.init::<Cpu>(&dev), 1);
        assert_eq!(a, b);
        assert_ne!(a, genesis_params::<Cpu, _>(&m, 2));
        assert_eq!(a.len(), m.num_params());
    }
}
