//! Channels-last layouts: 4-D (NHWC) and 5-D (channels-last-3d, NDHWC) copies and parameters keep
//! their values and shapes, change only their strides, and are told apart from contiguous ones.

use kiln_torch_ext::layout;
use tch::{Device, Kind, Tensor};

#[test]
fn four_and_five_dimensional_tensors_go_channels_last_with_the_same_values() {
    for shape in [vec![2i64, 3, 4, 5], vec![2, 3, 4, 5, 6]] {
        let t = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu));
        assert!(!layout::is_channels_last(&t).unwrap());
        let last = layout::to_channels_last(&t).unwrap();
        assert!(layout::is_channels_last(&last).unwrap(), "{shape:?}");
        assert_eq!(last.size(), shape);
        assert_eq!(
            last.stride()[1],
            1,
            "channels innermost: {:?}",
            last.stride()
        );
        assert!(last.equal(&t));
        let p = t.copy().set_requires_grad(true);
        layout::param_to_channels_last(&p).unwrap();
        assert!(layout::is_channels_last(&p).unwrap() && p.requires_grad() && p.equal(&t));
    }
}
