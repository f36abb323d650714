//! Process-wide math flags round-trip through libtorch. One test function, because the flags are
//! global to the process and tests in one binary run in parallel.

use kiln_torch_ext::flags::{self, Determinism, Flag, MatmulPrecision};

#[test]
fn global_flags_round_trip_through_libtorch() {
    // Matmul precision: every value sticks, and "high"/"medium" turn on TF32 for cuBLAS the way
    // torch.set_float32_matmul_precision does, "highest" turns it off.
    assert_eq!(
        flags::float32_matmul_precision().unwrap(),
        MatmulPrecision::Highest,
        "libtorch's default is highest"
    );
    for precision in MatmulPrecision::ALL {
        flags::set_float32_matmul_precision(precision).unwrap();
        assert_eq!(flags::float32_matmul_precision().unwrap(), precision);
        let tf32 = flags::flag(Flag::Tf32CuBlas).unwrap();
        assert_eq!(tf32, precision != MatmulPrecision::Highest, "{precision}");
    }
    flags::set_float32_matmul_precision(MatmulPrecision::Highest).unwrap();

    // Boolean flags: each can be flipped both ways, independently of the others.
    for flag in Flag::ALL {
        let before: Vec<bool> = Flag::ALL.iter().map(|f| flags::flag(*f).unwrap()).collect();
        let original = flags::flag(flag).unwrap();
        flags::set_flag(flag, !original).unwrap();
        assert_eq!(flags::flag(flag).unwrap(), !original, "{flag:?}");
        for (other, was) in Flag::ALL.iter().zip(&before) {
            if *other != flag {
                assert_eq!(
                    flags::flag(*other).unwrap(),
                    *was,
                    "{other:?} moved with {flag:?}"
                );
            }
        }
        flags::set_flag(flag, original).unwrap();
        assert_eq!(flags::flag(flag).unwrap(), original, "{flag:?}");
    }

    // Deterministic algorithms: all three modes.
    for mode in [Determinism::Error, Determinism::Warn, Determinism::Off] {
        flags::set_deterministic_algorithms(mode).unwrap();
        assert_eq!(flags::deterministic_algorithms().unwrap(), mode);
    }
}
