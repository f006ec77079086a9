//! What the configurations of the resources share: their builder setters.

/// Builder setters of a configuration, each `name(arg: Type) => field;`
/// (`=> field Some;` for an optional field), with its docs: a
/// `const fn name(mut self, arg: Type) -> Self` that sets the field.
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident($arg:ident: $ty:ty) => $field:ident $($some:ident)?;)*) => {$(
        $(#[$attr])*
        pub const fn $name(mut self, $arg: $ty) -> Self {
            self.$field = $crate::config::setters!(@value $arg $($some)?);
            self
        }
    )*};
    (@value $arg:ident) => { $arg };
    (@value $arg:ident Some) => { Some($arg) };
}
pub(crate) use setters;
